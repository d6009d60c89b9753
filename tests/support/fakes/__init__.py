"""Hand-written fakes at the package seams."""
