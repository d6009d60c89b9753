"""The built-in reference world model: real torch stages with LingBot's shapes and chunk contract, no weights
(`model`), and how it reads a prompt (`looks`)."""
