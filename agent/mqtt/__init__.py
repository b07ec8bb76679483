"""The wire, shared by the device and the operator: the link (the only module that imports
paho), the protocol's topics and documents, and the device's commands."""
