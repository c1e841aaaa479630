"""The `@NAME@` promptd plugin. Build it with `promptd plugin build` (gives @NAME@.wasm)."""

from promptd_sdk import Config, Plugin, Step, export_plugin


def cwd(step: Step) -> str:
    where = step.fact("cwd")
    return "" if where is None else f"Working in {where}."


def declare(config: Config) -> Plugin:
    return (
        Plugin()
        .section("@NAME@:rules", 50, "Answer as {{@NAME@_style}}.")
        .variable("@NAME@_style", config.get("style", "briefly as you can"))
        .dynamic_context("@NAME@:cwd", 50, cwd)
        # It reads the fact `cwd` only: asked again only when that changes.
        .reads(facts=["cwd"])
    )


# componentize-py looks for this class in app.py.
WitWorld = export_plugin(declare)
