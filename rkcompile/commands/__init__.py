"""The command layer behind the CLI's verbs that do more than plan: `run` (execute a plan on
the emulator and check it), `compare` (one model across SoCs) and `zoo` (regression over model
folders with goldens). rkcompile/cli.py turns arguments into options and calls these and the API.
"""
