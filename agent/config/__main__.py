"""``python -m agent.config``: print the JSON Schema of agent.yaml (docs/agent-config.schema.json)."""

from agent.config.loading import schema_json

print(schema_json(), end="")
