"""Model code: where a model's files come from, how texts become tokens, and the forward passes."""
