"""What giul-asgi serves over HTTP besides the app's answers: ``/energy``, and who may read it.

``endpoint`` is the ``/energy`` app; ``access`` holds the token, guard and loopback rules that
``/energy`` and ``giul-agent`` share. Nothing is imported here, so the agent, which needs only
``access``, does not load the statistics.
"""
