# Sourced by the tools/gpu and benchmarks shell scripts on the GPU machine: installs the carried
# wheels (.whl/*.whl, e.g. pydantic) into /tmp/site and puts it and the repository on PYTHONPATH.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$(pwd)
