"""On-disk contracts the build (build_engines/) and the runtime share; imports nothing of ours."""
