"""Session admission (layer 1) and the FIFO execution lease (layer 2)."""
