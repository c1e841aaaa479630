"""Example promptd plugin in Python. Build: sdk/python/build.sh sdk/python/examples/hello py_hello.wasm"""

from promptd_sdk import Config, Plugin, Step, export_plugin

ECHO_PARAMETERS = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}


def step_context(step: Step) -> str:
    return f"step {step.step_number} for {step.agent}"


def declare(config: Config) -> Plugin:
    return (
        Plugin()
        .section("hello", 10, "Hello from Python, {{who}}.")
        .variable("who", config.get("who", "world"))
        .dynamic_context("lang:step", 50, step_context)
        .tool("python_echo", "Echoes its `text` parameter back.", ECHO_PARAMETERS)
    )


WitWorld = export_plugin(declare)
