"""REST (FastAPI) and gRPC front ends over the same service functions."""
