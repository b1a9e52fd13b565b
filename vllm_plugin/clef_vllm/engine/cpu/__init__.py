"""What vLLM's CPU platform lacks for Clef releases: NVFP4 emulation and FP8 GEMMs for CPUs without AMX-FP8,
DeltaNet's causal convolution in fp32, the cores of each data-parallel rank, and the MoE experts' checks."""
