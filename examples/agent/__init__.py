"""A durable LLM agent: turns and tool calls are fenced tasks, so a crash costs no model call.

python -m examples.agent.run "what is 6 * 7?"     # see README.md
"""
