"""`regbench versions`: a loader's or vLLM's releases mapped by what a cell does under each (a
version map), and bisect to the release where that changes (docs/versions.md).

One package, one feature, in layers (pyproject.toml's import contracts):

    command   `regbench versions map|bisect` and its arguments
    trial     one trial per version: the weight audit under a streamer release, or one cell run
              through the runner under an image
    releases  vLLM releases (`--vllm`): each installed once into a cached venv, or an image tag
    render    the map as a console table and Markdown
    model     version maps, plans, bisect and its verdicts: pure, no I/O
"""
