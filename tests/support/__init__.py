"""What the tests share, so that no test module imports another: servers, fake devices and
clocks, waiting on conditions, settings, models, the corpus and reference outputs."""
