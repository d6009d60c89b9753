"""Offline chunked generation (`lingstream generate`): the command (`generate.py`), its records (`clip.py`), the
control trace format (`control_trace.py`), the MP4 writer (`mp4.py`) and the terminal output (`console.py`)."""
