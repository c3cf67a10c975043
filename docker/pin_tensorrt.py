"""Print pip constraints (``name==version``) for every installed distribution whose name starts with
``tensorrt``, so that installing gskit's ``trt`` extra keeps the container's own TensorRT."""

import importlib.metadata
import re


def constraints() -> list[str]:
    pins = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if re.sub(r"[-_.]+", "-", name.lower()).startswith("tensorrt"):
            pins[name] = dist.version
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    print("\n".join(constraints()))
