"""The gRPC API (proto/agentloop/v1/agent.proto): servicers over the same service functions as REST."""
