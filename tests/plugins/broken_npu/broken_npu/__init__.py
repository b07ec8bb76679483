"""A vendor plugin that loads its native library when imported, on a device where that library is
missing: importing it fails as ctypes would (edge-agent must leave it out, not stop)."""

raise ImportError("libbroken_npu.so.1: cannot open shared object file: No such file or directory")
