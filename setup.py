"""Installation script for captum_iglens."""

from setuptools import find_packages, setup

TEST_REQUIRES = [
    "pytest>=7",
    "hypothesis>=6",
    "nbclient>=0.9",
    "nbformat>=5",
    "ipykernel>=6",
    "ruff",
]

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
        "tqdm>=4.60",
        "scipy>=1.10",
    ],
    extras_require={
        "test": TEST_REQUIRES,
        "tutorials": ["jupyter", "nbclient>=0.9", "nbformat>=5", "ipykernel>=6"],
    },
    entry_points={"console_scripts": ["iglens=captum_iglens.cli:main"]},
)
