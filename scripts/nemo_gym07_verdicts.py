"""What `scripts/survey_nemo_gym_servers.py --release 0.7.0` says of each resources server of NVIDIA NeMo Gym 0.7.0's
wheel: the servers NeMo Gym 0.7.0's peer test checks row by row, those that ran here (`--try`), and those that do not
run here, grouped by the kind of reason. Data only; the survey script reads it.

A "why" that starts with "tried:" is what a `--try` printed; "not tried, from its code and config:" names what in the
0.7.0 folder needs the internet, a GPU, a container or a service. Servers with a requirement from git or a URL are
found by the script itself and need no entry here.
"""

from __future__ import annotations

# Servers checked against NeMo Gym 0.7.0's own ng_run, row by row (tests/test_nemo_gym07.py: ENVIRONMENTS).
TESTED = (
    "example_single_tool_call",
    "example_tool_call_multireward",
    "example_session_state_mgmt",
    "example_multi_turn_gymnasium",
    "example_multi_step",
    "mcqa",
    "gpqa_diamond",
    "lc_niah",
    "ragtruth",
    "citation_if",
    "string_match",
    "xlam_fc",
    "workplace_assistant",
    "frontierscience_judge",
    "equivalence_rule",
    "arc_agi",
    "ruler2",
)

# name -> why: started under our ng_run with `--try` (its <name>.yaml config unless said) and every row of its
# data/example.jsonl collected with the fake policy (a judge reference the config does not define pointed at
# policy_model; `++judge_base_url` etc. at the fake for a config's own judge_model).
RUNS_HERE: dict[str, str] = {
    "example_single_tool_call": "tool calls; reward 1.0 on every row with the fake",
    "example_session_state_mgmt": "per-session state: /seed_session, the tools and /verify share one counter",
    "example_tool_call_multireward": "rewards 2.0 and 1.0 with the fake",
    "example_multi_step": "multi-step tool use",
    "example_multi_turn_gymnasium": "gymnasium_agent",
    "conversational_tool_use_simulation": (
        "a nested agent implementation (responses_api_agents/conversational_tool_use/simulation), its simulator model"
        " `_copy: policy_model` (the fake); rewards 0.0 with the fake"
    ),
    "workplace_assistant": "stateful tools per session",
    "multichallenge": "judge: calls `policy_model` itself",
    "text_to_sql": "judge: calls `policy_model` itself",
    "proof_judge": "judge: calls `policy_model` itself",
    "proof_verification": "judge: calls `policy_model` itself",
    "simpleqa": "judge: its `genrm_model` reference pointed at `policy_model`",
    "omniscience": "judge: its `genrm_model` reference pointed at `policy_model`",
    "abstention": "judge: its `genrm_model` reference pointed at `policy_model`",
    "aalcr": "judge: its `Qwen3-235B-A22B-Instruct-2507-FP8` reference pointed at `policy_model`",
    "inverse_if": "judge: its `judge_model` reference pointed at `policy_model`",
    "physics_judge": "judge: its `judge_model` reference pointed at `policy_model`; math-verify",
    "ugphysics_judge": "judge: its `judge_model` reference pointed at `policy_model`; math-verify",
    "math_with_autograder": "judge: its `judge_model` reference pointed at `policy_model`; math-verify",
    "math_with_judge": "judge: calls `policy_model` itself; math-verify",
    "polymath": "judge: calls `policy_model` itself; math-verify",
    "equivalence_llm_judge": "judge: calls `policy_model` itself; datasets==4.0.0 in its own environment",
    "frontierscience_judge": "judge: its own `judge_model` (NeMo Gym's openai_model) with ++judge_base_url at the fake",
    "imo_proofbench_judge": "judge: its own `judge_model` (NeMo Gym's openai_model) with ++judge_base_url at the fake",
    "over_refusal_detection": (
        "judge: its own `judge_model` (NeMo Gym's openai_model) with ++judge_base_url at the fake; rewards 0.5"
    ),
    "equivalence_rule": "config lc.yaml",
    "nvarc": "config inductive.yaml",
    "format_verification": "config freeform_formatting.yaml",
    "arc_agi": "",
    "xlam_fc": "",
    "hotpotqa_qa": "",
    "imo_gradingbench": "",
    "indirect_prompt_injection": "",
    "math_proof_judgement": "",
    "math_advanced_calculations": "",
    "proof_genselect": "",
    "ruler": "",
    "mcqa": "requirement tiktoken",
    "graphwalks": "requirement tiktoken",
    "mrcr": "requirement tiktoken",
    "gpqa_diamond": "imports resources_servers.mcqa.app (recognised as a NeMo Gym folder through it)",
    "bunsenbench_chemistry_mcq": "imports resources_servers.mcqa.app",
    "circle_click": "image rows for a vision model (the text-only fake ignores the image)",
    "circle_count": "image rows for a vision model (the text-only fake ignores the image)",
    "swe_pivot": "tool_simulation_agent",
    "single_step_tool_use_with_argument_comparison": "tool_simulation_agent; rewards 0 and 1 with the fake",
    "calendar": "requirement rich",
    "math_with_code": "requirements numpy, scipy, pandas",
    "structeval": "config structeval_nonrenderable.yaml; xmltodict, toml; rewards 0 and 0.2 with the fake",
    "structured_outputs": "config structured_outputs_v4.yaml",
    "terminus_judge": "config terminus_judge_simple.yaml (judge `policy_model`); openapi-schema-validator",
    "terminal_multi_harness": "config terminal_multi_harness_codex.yaml (tool_simulation_agent); rewards 1 and 0",
    "code_gen": "numpy 2.2.6 in its own environment; the unit tests of its rows run locally",
    "verifif": "its judge defaults to `policy_model`",
    "swerl_llm_judge": "requirements datasets, transformers, tiktoken",
    "speed_bench": "simple_agent; no vLLM /metrics to read behind the fake",
    "jailbreak_detection": (
        "config jailbreak_detection_nemotron_combined_reward_tp8.yaml (5 agents), its `safety_judge_model` reference"
        " pointed at `policy_model` instead of the vLLM judge"
    ),
    "labbench2_vlm": "image/PDF rows for a vision model (the text-only fake ignores them)",
    "asr_with_pc": "audio rows for a speech model (the text-only fake ignores the audio); jiwer, whisper_normalizer",
    "blackjack": "gymnasium_agent; rewards -1 and 1 from an unseeded deck (random.Random()), so two runs differ",
    "grl_tetris": (
        "gymnasium_agent; starts and answers, but the fake's text has no <action> tag, which the server answers"
        " with an error ('No <action>Left|Right|Down</action> tags found in response', a 500 from /run): its rows"
        " need a real policy"
    ),
    "grl_sokoban": (
        "gymnasium_agent, gym-sokoban; as grl_tetris, the fake's text is no action ('Unable to parse action from"
        " response')"
    ),
    "reasoning_gym": "requirement reasoning-gym",
    "arena_judge": (
        "its own judge instance (NeMo Gym's openai_model, ARENA_JUDGE_* variables) pointed at the fake with"
        " ++arena_judge_judge_model...openai_base_url"
    ),
    "citation_if": "rewards 0 and 1 with the fake",
    "lc_niah": "",
    "ragtruth": "rewards 0 and 1 with the fake",
    "string_match": "requirement fastapi",
    "aegis_v4_safety": (
        "judge: its `aegis_v4_model` reference (a vLLM model of another config) pointed at `policy_model`"
    ),
    "agentif": "judge: its own `judge_model` (NeMo Gym's openai_model) with ++judge_base_url at the fake; datasets",
    "bbq": (
        "judge: its `bbq_judge_model` reference pointed at `policy_model`; starts and answers, but its judge must"
        " answer one JSON object and the fake's text is none: 'JudgeOutputError(Explanation Quality Check did not"
        " return exactly one JSON object ...)' (a 500 from /run): its rows need a real judge"
    ),
    "false_statement_judge": "judge: its `judge_model` reference pointed at `policy_model`",
    "generative_reward_model": (
        "config genrm_train.yaml; rewards -100 with the fake (its parse_failure_penalty: the fake's text has no score)"
    ),
    "gui_coordinate": "requirement fastapi; image rows for a vision model (the text-only fake ignores the image)",
    "iheval": "rewards 0 and 1/6 with the fake; rouge-score, nltk, langdetect",
    "image_tools": "config image_tools_pivot.yaml (tool_simulation_agent); numpy, pillow",
    "longmemeval": "judge: its own `judge_model` (NeMo Gym's openai_model) with ++judge_base_url at the fake",
    "openair_congestion": "gymnasium_agent; negative rewards (-22 to -29) with the fake",
    "spartqa": (
        "its config's datasets name a `license` (CC-BY-SA-4.0), which NeMo Gym 0.7.0's own ng_run refuses"
        " (tests/test_nemo_gym07.py); ours starts it"
    ),
    "ruler2": "requirement editdistance (declared in its requirements.txt, installed in its environment)",
    "litmus_agent": (
        "its optional code-execution tool would run in OpenSandbox (the config's opensandbox provider); the fake"
        " never calls it"
    ),
    "scicodepile": "the tests of its rows run locally in a subprocess",
    "assaybench": "requirement assaybench",
    "fukuyamabench": "requirement rdkit",
    "moldetox": "requirements rdkit, safe-mol",
    "toolsandbox": (
        "its toolsandbox_agent (the config includes its config file); the user simulator is `policy_model`;"
        " ToolSandbox's tools run in-process"
    ),
    "arena": (
        "config lmarena_v2.yaml; its own `judge_model` (NeMo Gym's vllm_model, an OpenAI-compatible client) pointed"
        " at the fake with ++judge_model...base_url"
    ),
}

# what the opening list says of the servers that run: those whose rows the fake policy cannot play
RUNS_CAVEATS = (
    "Of these, grl_tetris and grl_sokoban answer the fake policy's text (no action) with an error, so their rows need"
    " a real policy, and bbq's judge must answer JSON, which the fake does not, so its rows need a real judge;"
    " blackjack's rewards are random (an unseeded deck); circle_click, circle_count, gui_coordinate, labbench2_vlm"
    " and asr_with_pc have image or audio rows that the text-only fake ignores."
)

STATIC = "not tried, from its code and config: "
# the SWE servers new in 0.7.0 share one setup
SWE_SANDBOX = (
    STATIC + "`sandbox_provider: sandbox` names a sandbox block the config leaves to the user (Docker, Apptainer,"
    " OpenSandbox, Daytona, E2B...) in which each task's prebuilt container image runs; its only allowed agent is"
    " opencode_sandboxed_agent (OpenCode inside that sandbox)"
)
# the web-research servers new in 0.7.0 share one agent
EXA_HARNESS = (
    STATIC + "its agent harness_exa_search runs a coding harness (Claude Code by default) in a sandbox"
    " (`sandbox_provider: sandbox`, image nikolaik/python-nodejs, set up with pip and npm installs from GitHub and npm)"
    " that researches the web with Exa search (EXA_API_KEY)"
)

# kind of reason (what they need, as the opening list of the doc says it) -> {name -> why}
NOT_HERE: dict[str, dict[str, str]] = {
    "a sandbox provider or a container runtime (Docker, Apptainer, OpenSandbox, ...) with each task's image": {
        "deepswe": SWE_SANDBOX + "; its rows name public.ecr.aws images",
        "denovo_swe": SWE_SANDBOX,
        "scale_swe": SWE_SANDBOX,
        "swe_next": SWE_SANDBOX + "; its rows name their docker_image",
        "swe_rebench": SWE_SANDBOX,
        "swebench": SWE_SANDBOX,
        "swebench_pro": SWE_SANDBOX.replace(
            "its only allowed agent is opencode_sandboxed_agent (OpenCode inside that sandbox)",
            "images from docker.io/jefzda/sweap-images",
        ),
        "swemer_oml": SWE_SANDBOX,
        "swemer_v1": SWE_SANDBOX + "; its data set is internal to NVIDIA",
        "swemer_v2": SWE_SANDBOX,
        "terminal_bench_2_1": SWE_SANDBOX.replace(
            "its only allowed agent is opencode_sandboxed_agent (OpenCode inside that sandbox)",
            "its rows name their docker_image (e.g. alexgshaw/path-tracing)",
        ),
        "terminal_bench_4": (
            STATIC + "/seed_session provisions each task's sandbox (OpenSandbox) and /verify runs the official"
            " verifier in it; its agent is miniswe_sandboxed_agent"
        ),
        "vibench": (
            STATIC + "builds and grades each web application in OpenSandbox sandboxes (build image"
            " app-bench-base:latest) and drives it in a browser"
        ),
        "job_bench": (
            STATIC + "a sandbox per task (`sandbox_provider: sandbox`, image python:3.13-bookworm) for its"
            " harness_agent; its task files come from the Hugging Face hub"
        ),
        "workspace_bench": (
            STATIC + "a sandbox per task and a judge sandbox (`sandbox_provider: sandbox`, image"
            " node:24-bookworm-slim) for its harness_agent; its task files come from the Hugging Face hub"
        ),
        "legal_agent_bench": (
            STATIC + "its harbor_agent works on each task's documents inside Docker (Harbor environments)"
        ),
        "osworld": (
            STATIC + "an OSWorld control plane over remote Docker/QEMU workers (`workers: []`, discovered from the"
            " head; OSWORLD_RESOURCES_TOKEN)"
        ),
        "deepsearchqa": EXA_HARNESS,
        "widesearch": EXA_HARNESS,
        "cvdp": STATIC + "runs hardware-verification harnesses in Docker/Apptainer (its `cvdp_sim_image`)",
        "swerl_gen": STATIC + "runs SWE-bench tests in Singularity/Docker images (eval/singularity_utils.py)",
    },
    "a GPU (a model served by vLLM)": {
        "xstest": (
            "tried: its judge is a local_vllm_model instance (WildGuard served by vLLM on a GPU), which exits at"
            " start: 'ModuleNotFoundError: No module named vllm'"
        ),
        "genrm_compare": (
            STATIC + "its judge is a GenRM reward model that its own genrm_model server (NeMo Gym's local vLLM"
            " model) downloads and serves on vLLM (data parallel, GPUs)"
        ),
        "wmt_translation": (
            STATIC + "its config computes xCOMET-XXL (`compute_comet: true`, Unbabel/XCOMET-XXL from the Hugging"
            " Face hub) on a Ray pool of 8 GPU actors; torch 2.12 in its environment"
        ),
    },
    "the internet at run time (a web API with a key, a hub or web download, a git clone)": {
        "browsecomp_advanced_harness": (
            STATIC + "web search through the Tavily API (API key, internet); a judge of its own (`search_judge_model`)"
        ),
        "finance_sec_search": STATIC + "SEC EDGAR (SEC.gov) and Tavily over the internet",
        "ether0": (
            "tried: exits at start, cloning its ether0 repository from GitHub ('git clone --depth=1"
            " https://github.com/Future-House/ether0 ...' returned non-zero exit status 128)"
        ),
        "newton_bench": (
            "tried: exits at start, cloning NewtonBench from GitHub ('fatal: unable to access"
            " https://github.com/HKUST-KnowComp/NewtonBench/: Could not resolve host: github.com')"
        ),
        "bird_sql": (
            "tried: exits at start, downloading the BIRD databases (https://bird-bench.oss-cn-beijing.aliyuncs.com/"
            "dev.zip): 'URLError: Name or service not known'"
        ),
        "critpt": (
            "tried: exits at start: its config's api_key for Artificial Analysis' grading API (internet) is unset"
            " ('ValidationError: 2 validation errors for CritPtResourcesServerConfig api_key ... input_value=None')"
        ),
        "google_search": (
            "tried: exits at start: web search through Google's API needs its key ('ValidationError: 2 validation"
            " errors for GoogleSearchResourcesServerConfig google_api_key Field required ... google_cx Field"
            " required')"
        ),
        "spider2_lite": (
            "tried: exits at start, downloading the Spider 2.0-lite databases from Google Drive: 'URLError: Name or"
            " service not known'"
        ),
        "evalplus": (
            "tried: exits at start, downloading the HumanEval+/MBPP+ data sets from the web (evalplus' urlretrieve:"
            " 'URLError: Name or service not known')"
        ),
        "bigcodebench": (
            "tried: exits at start: it builds a Python 3.10 environment in its folder ('uv venv --seed --python 3.10"
            " .../bigcodebench/.bcb_venv' returned non-zero exit status 2: no Python 3.10 here, and uv's download of"
            " one needs the internet); then BigCodeBench's requirements from GitHub"
        ),
        "scicode": (
            "tried: starts, but every rollout fails: 'RuntimeError(test_data_fpath is not configured. Stage SciCode's"
            " test_data.h5 ...)' (a data file the wheel does not ship, staged by hand from SciCode's release)"
        ),
        "rolemrc": (
            "tried: config rolemrc.yaml (reference mode, whose agent rolemrc_simple_agent its example rows name) exits"
            " at start: \"LookupError: Resource 'wordnet' not found. Please use the NLTK Downloader\" (and its"
            " BERTScore downloads roberta-large from the Hugging Face hub); config rolemrc_judge.yaml starts, but its"
            " rows name that agent, which it does not define, so our ng_collect_rollouts collects none"
        ),
        "tavily_search": (
            "tried (config tavily_search_judge_openai_model.yaml): its config needs a Tavily API key and a search"
            " judge ('Interpolation key search_judge_model_base_url not found'); web search through the Tavily API"
        ),
        "example_mcp_weather": (
            "tried: its agent is claude_code_agent, whose config needs an Anthropic API key ('Interpolation key"
            " anthropic_api_key not found'); the agent installs Claude Code's CLI with npm and Node.js downloads"
        ),
        "indian_banking": (
            "tried: starts, but every rollout fails: 'FileNotFoundError(.../resources_servers/indian_banking/data/"
            "db.json not found. db.json (and kb.json) live in the Hugging Face dataset repo"
            " NPCI/nemo-gym-indian-banking; download them ... before serving)'"
        ),
        "gdp_pdf": (
            "tried: starts, but every rollout fails: 'FileNotFoundError(Document manifest not found: .../gdp_pdf/data/"
            "test_media/documents/.../manifest.json. Source documents are not committed. Fetch and render them with:"
            " gym eval prepare --benchmark gdp_pdf)' (the documents of the Hugging Face data set surgeai/GDP.pdf)"
        ),
        "interactive_browser": (
            "tried: starts, but every rollout fails: 'RuntimeError(Could not install Playwright Chromium, which the"
            " local browser backend needs. `python -m playwright install chromium` exited 1. Error: getaddrinfo"
            " ENOTFOUND cdn.playwright.dev)'"
        ),
        "wordle": (
            "tried: starts, but every rollout fails: 'FileNotFoundError(.../resources_servers/wordle/data/guesses.txt"
            " not found. Run `python resources_servers/wordle/generate_data.py` first.)': the wheel does not ship its"
            " word lists, and generate_data.py downloads them from GitHub"
        ),
    },
    "a service of their own (a NeMo Skills sandbox, LibreOffice)": {
        "competitive_coding_challenges": (
            "tried: exits at start: 'RuntimeError: Sandbox not ready after waiting 240s' (a NeMo Skills code sandbox"
            " server at NEMO_SKILLS_SANDBOX_HOST/PORT, default 127.0.0.1:6000); its test data (~27 GB) is loaded at"
            " start"
        ),
        "math_formal_lean": (
            STATIC + "needs a Lean 4 sandbox server (NEMO_SKILLS_SANDBOX_HOST/PORT, default 127.0.0.1:6000)"
        ),
        "gdpval": (
            STATIC + "needs LibreOffice (setup_libreoffice.py) and a judge model of its own"
            " (`gdpval_judge_model`); reference files under GDPVAL_REFS_ROOT"
        ),
    },
    "an install through pyproject.toml, which our ng_run does not read": {
        "vlm_eval_kit": (
            STATIC + "installs through pyproject.toml (no requirements.txt: our ng_run installs only"
            " requirements.txt), accelerate, bert_score and VLMEvalKit; image benchmarks for a vision model, data"
            " fetched from the web"
        ),
    },
    "nothing: they are not servers (a base class, a library)": {
        "gymnasium": (
            "tried: exits at once with code 0 and an empty log: a base class for other servers (its config says 'Not"
            " a standalone server'; base.py starts nothing)"
        ),
        "sec_local_index": (
            "tried: no app.py: its config's entrypoint local_edgar_search.py is a library of SEC EDGAR search for"
            " finance_sec_search and finance_agent_v2 ('Not a standalone server'); detect_framework finds no NeMo Gym"
            " server in it, so ng_run builds it as one of ours and uv stops at its `-e nemo-gym[dev] @ ../../` line"
            " ('does not appear to be a Python project')"
        ),
    },
}

# the notes under the counts: how our ng_run runs the wheel's folders, seen in the tries
NOTES = [
    (
        "- Each config's environment servers (`legacy_agent` in front of the agent in most, `single_agent_turn_legacy`,"
        " `nemo_user_sim`) start with it under our ng_run, on the NeMo Gym 0.7.0 release; the rows here were collected"
        " through each agent instance. `tests/test_nemo_gym07.py` also collects through the environment servers."
    ),
    (
        "- A server whose rows need files the wheel does not ship (wordle, indian_banking, gdp_pdf, scicode) starts"
        " here; the missing file shows on the first rollout, as a failure in the collector's failures file."
    ),
    (
        "- A defect of ours, seen here and fixed (conversational_tool_use_simulation): `detect_release` took"
        " `implementation_dir.parent.parent` for a folder's tree, wrong for 0.7.0's nested implementations"
        " (`responses_api_agents/conversational_tool_use/simulation`): the agent ran on 0.4.0 and exited"
        " ('ModuleNotFoundError: No module named responses_api_agents.conversational_tool_use'). It now takes the"
        " parent of the nearest ancestor named by a server type (`nemo_gym.upstream.detect.server_tree`;"
        " `tests/test_nemo_gym_detect.py`), and the server runs."
    ),
    (
        "- Two configs that define the same instance name (rolemrc_judge.yaml's and lmarena_v2.yaml's `judge_model`)"
        " merge into one invalid instance when tried in one ng_run ('refers to server instance judge_model, which is"
        " not in the config'); `--try` them in separate runs."
    ),
    (
        "- In a first try of 20 servers in one ng_run (60 NeMo Gym processes on 2 cores), one `legacy_agent` hung in"
        " Ray's core worker start (its python-core-driver log stops at 'Constructing CoreWorkerProcess') and ng_run"
        " waited for it; batches of 10 to 15 servers did not meet it."
    ),
]
