"""The HTTP server: the OpenAI, TEI, Cohere and infinity APIs over the registry, in-process."""
