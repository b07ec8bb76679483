"""The deployment life cycle on the device: the desired documents followed (`desired`), the
device's part in a staged rollout (`wave_plan`), the bundle fetched (`download`, `transfer`),
installed through `agent.bundles`, watched on probation (`probation`) and reported
(`optimisation_report`), all driven by the `Deployer`'s worker thread (`deployer`). The daemon
composes this room; it never imports the daemon."""
