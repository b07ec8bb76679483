"""agent.yaml: the models (`models`), loading with line numbers (`loading`), the example (`example`)."""
