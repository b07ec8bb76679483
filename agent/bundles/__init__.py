"""Model bundles on disk, no MQTT: the manifest, signing, the archive (build, unpack, verify), the
store of installed versions, and the local install state machine."""
