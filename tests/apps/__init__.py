"""Small apps that tests run in child processes."""
