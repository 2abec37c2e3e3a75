"""Helpers the tests share: fake devices on a simulated clock, and small builders of queue work."""
