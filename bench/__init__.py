"""The benchmarks, each a module run from the repository root as `python -m bench.<name>` (`--quick` for a smoke
run); what they share is in `bench/_common.py`. README.md and docs/ give each command and what it measured;
`tests/bench/test_commands.py` runs every documented command."""
