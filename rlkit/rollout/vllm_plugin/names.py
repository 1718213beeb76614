"""The names rlkit registers with vLLM (kept apart from the plugin's entry point, so the model and the
worker import them without importing the plugin package back)."""

MODEL_ARCH = "RlkitQwen3ForCausalLM"
ATTENTION_BACKEND = "RLKIT_STRICT"
CONTRACT_KEY = "rlkit_contract"
"""The hf_config attribute (set through hf_overrides) that carries the engine's contract as JSON."""
WORKER_EXTENSION = "rlkit.rollout.vllm_plugin.worker.RlkitWorkerExtension"
