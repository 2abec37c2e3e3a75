"""Each API family's wire format, one module a family: its request table (read by both the
checks and the OpenAPI document), its responses' shapes and its operations' description."""
