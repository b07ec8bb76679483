"""The only room that wires components together: the agent (`edge-agent run`), which composes
the deployment room (agent/deployment/), and the telemetry and status documents."""
