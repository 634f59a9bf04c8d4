"""The sdcloud host agent: runs on the GPU host, never imports the control plane."""
