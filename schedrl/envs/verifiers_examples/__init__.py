"""verifiers environments written as the Environments Hub writes them (`load_environment(**kwargs)` in a
module named by its id), for the `verifiers` adapter's recipe and tests: `sort_xml` (single turn, an
XML-tagged answer, a rubric of correctness and format), `guess` (a multi-turn game with
`env_response`), `calc_tools` (a `ToolEnv` with a Python tool). Each needs `schedrl[verifiers]`."""
