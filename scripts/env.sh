# Sourced by the scripts: where the torch wheel lives and how CMake finds its libtorch.
#   TANDEM_VENV            the virtual environment (default ~/.local/share/tandem/venv), outside
#                          every checkout so that clones share it; scripts/install-deps fills it
#   TANDEM_TORCH_VERSION   the torch wheel built and tested against (the GPU machines' version)
#   TANDEM_PYTHON          its python; its bin/ goes first on PATH (python3, torchrun)
# A machine that already has torch (the offline GPU machine's /opt/torch/.venv) names it:
#   TANDEM_VENV=/opt/torch/.venv bash scripts/test
TANDEM_TORCH_VERSION=2.11.0
TANDEM_VENV=${TANDEM_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/tandem/venv}
TANDEM_PYTHON=$TANDEM_VENV/bin/python3
export TANDEM_VENV TANDEM_TORCH_VERSION TANDEM_PYTHON
case ":$PATH:" in
  *":$TANDEM_VENV/bin:"*) ;;
  *) export PATH="$TANDEM_VENV/bin:$PATH" ;;
esac

# CMake arguments that point at the venv's libtorch and python (after install-deps).
tandem_cmake_args() {
  local prefix
  prefix=$("$TANDEM_PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  echo "-DCMAKE_PREFIX_PATH=$prefix -DPython3_EXECUTABLE=$TANDEM_PYTHON"
}
