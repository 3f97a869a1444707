"""The engine: core loop, offline LLM API, output processing, detokenization."""
