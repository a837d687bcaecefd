"""The steps of the lab's measurement notebooks, as tested library code.

The notebooks explain; these modules do the work, so that each notebook cell is a call or two. Every
value a step needs (URLs, how long to wait, where records go) comes from the notebook's parameters
cell, passed in as arguments; nothing here reads notebook globals.

* ``servelab.run.walkthrough.common``: ``wait_until`` (poll until a probe says what we want),
  ``utilization(record)`` (one line of CPU/GPU use), ``try_gourmetgram`` (classify the photo through
  the web page, as a user would), ``latest(records)`` (the newest run of each measurement),
  ``drawn`` (the report's plots that exist), ``load_command`` (the `servelab load` command a helper's run
  stands for, printed beside it).
* ``servelab.run.walkthrough.walk_fastapi``: ``FastAPIWalkthrough`` (``4_fastapi``: wait for a service, measure
  it) and ``queueing(alone, busy)`` (Little's law and the inference ceiling from a sequential and a
  concurrent run).
* ``servelab.run.walkthrough.walk_triton``: ``TritonWalkthrough`` (``6_triton_python``, ``7_triton_onnx`` and
  ``8_triton_more``: switch to or wait for a stage, measure it with ``servelab load`` and
  ``perf_analyzer``), ``open_loads`` and ``batch_count_change``.
* ``servelab.run.walkthrough.walk_ray``: ``RayWalkthrough`` (``10_ray``: wait until the Ray Serve app reports
  the stage deployed from the head's shell, measure it as ``4_fastapi`` does).
* ``servelab.run.walkthrough.ray_nodes``: ``9_ray_setup``'s steps with python-chi (lease two nodes, start,
  prepare and connect them, bring up the head's and the worker's compose files).
* ``servelab.run.walkthrough.chameleon``: ``origin_url``, ``wait_active``, ``reach``, ``run`` and ``release``,
  shared by the provisioning notebooks.
* ``servelab.run.walkthrough.runbook``: what fails in class and what to do (docs/class.md's table), printed by
  the steps above when they fail.
* ``servelab.run.walkthrough.classroom``: a class's leases (``1_create_lease``'s instructors' section) and where
  each student stands (``servelab class status``).
* ``servelab.run.walkthrough.node_setup``: the commands that prepare a node (Docker, NVIDIA's toolkit,
  servelab and the model), run by ``2_create_server_nvidia`` and ``9_ray_setup``.
* ``servelab.run.walkthrough.stage_switch``: ``run_switch`` (run a stage switch with progress and a bound)
  and ``diagnosis`` (Triton's own account of its models and log, for the error).
"""
