"""The package list for setuptools; everything else about the build is in pyproject.toml.

`accelerate_configs/` and `recipes/` stay where the README's commands name them, and the wheel
carries them as the data packages `accel_mnist.accelerate_configs` and `accel_mnist.recipes`
(read by accel_mnist/shipped.py). A folder this checkout does not have is left out.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
DATA_FOLDERS = {"accelerate_configs": ["*.yaml", "*.json", "README.md"], "recipes": ["*.yaml", "*.yml", "README.md"]}
present = {f"accel_mnist.{folder}": folder for folder in DATA_FOLDERS if (HERE / folder).is_dir()}

setup(
    packages=[*find_packages(include=["accel_mnist", "accel_mnist.*"]), *present],
    package_dir={"accel_mnist": "accel_mnist", **present},
    package_data={package: DATA_FOLDERS[folder] for package, folder in present.items()},
)
