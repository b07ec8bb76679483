"""Reads the device, never decides: the board probe, the `SysFS(root)` reader, CPU and memory."""
