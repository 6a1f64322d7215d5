"""The run itself: a scenario's federation on Flower's simulation engine and Ray.

The runner assembles the components over the kernel and drives the round
loop through Flower's Grid; around it: discovery of the SuperNodes, the
Flower boundary (messages in and out), the run's lifecycle (signals, stops,
child processes), Ray resources and the audit's reservation, failure
injection and checkpoints. The command line and the Flower app import it.
"""
