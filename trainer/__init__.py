"""The bundled trainer for kernel-writing agents: the agent's environment (a workdir per
episode, its tools, a sandboxed shell and the compile/verify/profile commands), rollouts and
training on their trajectories. Importing this package imports nothing, so ``trainer.commands``
starts light inside the sandbox.
"""
