"""Model calls: the LiteLLM gateway (hosted APIs, local servers) and in-process local models."""
