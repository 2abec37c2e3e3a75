"""The HTTP server: OpenAI and TEI embedding APIs over the registry, served in-process."""
