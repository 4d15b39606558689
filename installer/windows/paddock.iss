; Inno Setup 6 script: PaddockStudio-<version>-setup.exe from the PyInstaller one-folder build.
;
;   iscc /DAppVersion=0.1.0 installer\windows\paddock.iss
;   (build_windows.ps1 runs the whole chain; README.md, "Building the installers")
;
; Per-user install, no administrator rights: {autopf} is %LOCALAPPDATA%\Programs, the .gguf
; association goes to HKCU (HKA). User data lives in %LOCALAPPDATA%\paddock-studio (models, settings,
; conversations) and stays on uninstall unless the user asks for it to go.
;
; Signing hook: pass a sign tool named "paddock" on the command line and both the installer and
; the uninstaller are signed with it, e.g.
;   iscc /DSignTool=paddock "/Spaddock=signtool sign /fd sha256 /tr http://timestamp.example /td sha256 /a $f" ...
; (the program files themselves are signed before this step: build_windows.ps1, $env:PADDOCK_SIGN_COMMAND).

#define AppName "Paddock Studio"
#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#ifndef SourceDir
  ; the one-folder build, relative to this script
  #define SourceDir "..\..\build\installer-13\dist\PaddockStudio"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif

[Setup]
AppId={{8E4D2C71-3B5A-4F0E-9C36-6B1D7A2E5F90}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Paddock Studio
DefaultDirName={autopf}\Paddock Studio
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
ChangesAssociations=yes
OutputDir={#OutputDir}
OutputBaseFilename=PaddockStudio-{#AppVersion}-setup
SetupIconFile={#SourceDir}\_internal\resources\icons\paddock.ico
UninstallDisplayIcon={app}\PaddockStudio.exe
UninstallDisplayName={#AppName}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
#ifdef SignTool
SignTool={#SignTool}
SignedUninstaller=yes
#endif

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "gguf"; Description: "Open .gguf model files with {#AppName}"; GroupDescription: "File associations:"

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\PaddockStudio.exe"; Comment: "Local LLMs on your GPU"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\PaddockStudio.exe"; Tasks: desktopicon

[Registry]
; .gguf -> "PaddockStudio.gguf": offered in Open with, opening loads the model in the Studio
Root: HKA; Subkey: "Software\Classes\.gguf\OpenWithProgids"; ValueType: string; ValueName: "PaddockStudio.gguf"; ValueData: ""; Flags: uninsdeletevalue; Tasks: gguf
Root: HKA; Subkey: "Software\Classes\PaddockStudio.gguf"; ValueType: string; ValueName: ""; ValueData: "GGUF model"; Flags: uninsdeletekey; Tasks: gguf
Root: HKA; Subkey: "Software\Classes\PaddockStudio.gguf\DefaultIcon"; ValueType: string; ValueName: ""; ValueData: "{app}\PaddockStudio.exe,0"; Tasks: gguf
Root: HKA; Subkey: "Software\Classes\PaddockStudio.gguf\shell\open\command"; ValueType: string; ValueName: ""; ValueData: """{app}\PaddockStudio.exe"" studio --model ""%1"""; Tasks: gguf

[Run]
Filename: "{app}\PaddockStudio.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; compiled kernels: a cache the engine rebuilds, never the user's data
Type: filesandordirs; Name: "{localappdata}\paddock\kernels"

[Code]
const
  UserDataDir = '{localappdata}\paddock-studio';

function PurgeAsked(): Boolean;
var
  I: Integer;
begin
  Result := False;
  for I := 1 to ParamCount do
    if CompareText(ParamStr(I), '/PURGEUSERDATA') = 0 then
      Result := True;
end;

procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
var
  Folder: String;
begin
  if CurUninstallStep <> usPostUninstall then
    Exit;
  Folder := ExpandConstant(UserDataDir);
  if not DirExists(Folder) then
    Exit;
  { Kept unless asked: a silent uninstall deletes only with /PURGEUSERDATA. }
  if PurgeAsked() or ((not UninstallSilent()) and (MsgBox(
      'Also delete your models, settings and conversations in ' + Folder + '?' + #13#10 +
      'Choose No to keep them for a later installation.', mbConfirmation, MB_YESNO or MB_DEFBUTTON2) = IDYES)) then
    DelTree(Folder, True, True, True);
end;
