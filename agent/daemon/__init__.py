"""The only room that wires components together: the agent (`edge-agent run`), the deployer
that follows desired documents, bundle transfers, and the telemetry and status documents."""
