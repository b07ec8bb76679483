"""Stand-in (a test double): OpenVINO absent, as on a device without the `openvino` extra, so the
crashing onnxruntime beside it is the only ONNX runtime the process could use."""

raise ImportError("No module named 'openvino' (stand-in: this device has no OpenVINO)")
