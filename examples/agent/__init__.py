"""A durable pydantic-ai agent: model requests are journaled steps and tool calls are fenced
child tasks, so a crash costs no finished model call and no committed tool result.

python -m examples.agent.run "what is 6 * 7?"     # see README.md
"""
