"""The route handlers, one module a family: each reads its request with its family's parser
(`protocol`) and answers in its family's shapes."""
