"""Apollo-11 plugins in Python.

    from apollo_plugin import Plugin, Param

    class Greet(Plugin):
        name = "greet"
        version = "1.0.0"
        params = [Param("who", "string", required=True, description="whom to greet")]

        def execute(self, params, ctx):
            ctx.log("greeting", params["who"])
            return {"greeted": params["who"]}

    if __name__ == "__main__":
        Greet.main()

One class answers both of the agent's modes (one-shot and worker); the
params are checked against their declared types before validate is called;
an exception is a permanent failure naming its type, message and line.
`python -m apollo_plugin.test my_plugin.py` runs the checks of
`apollo-agent plugin test`; `apollo_plugin.testing.Harness` calls a plugin in
the author's own tests.
"""
from ._core import Context, Fail, Outcome, Plugin, Retry
from ._describe import DescribeError, Param

__all__ = ["Context", "DescribeError", "Fail", "Outcome", "Param", "Plugin", "Retry"]
__version__ = "1.0.0"
