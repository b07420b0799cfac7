"""agentloop: an agent-as-a-service backend that learns online."""

__version__ = "0.1.0"
