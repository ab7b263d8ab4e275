"""What iPXE would do with a script: the simulator's stand-in for firmware.

``interpret_script(script, variables)`` runs a script the way iPXE runs ours
and returns the first action that ends the script's control of the machine:
a ``chain`` to another script (the caller fetches and interprets it), a
kernel boot, a SAN boot, a local-disk boot, an error exit or a plain exit.

Supported, as iPXE does it: ``#`` comments, ``:labels`` and ``goto``,
``${name}`` / ``${name:type}`` expansion with nesting
(``${net${i}/mac:hexhyp}``) done on the whole line before it is split, ``||``,
``&&`` and ``;`` tokens (including a trailing ``||`` that ignores a failure), a failing command without ``||`` ending the script
with an error, and the commands ``echo``, ``set``, ``clear``, ``inc``,
``isset``, ``iseq``, ``imgfree``, ``kernel``/``imgselect``, ``initrd``/
``imgfetch``, ``imgargs``, ``boot``, ``chain``, ``sanhook``, ``sanboot``,
``sleep``, ``prompt``, ``dhcp``/``ifconf``, ``exit``, ``reboot``/``poweroff``.

Downloads are assumed to succeed and ``sleep`` takes no time; a script that
keeps looping is stopped after a bounded number of commands and reported as
an error. ``chain`` never returns here, so boot.ipxe's fallbacks to other
NICs and the UUID are not followed: the caller interprets the chained script.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_STEPS = 10_000
_VALUE_OPTIONS = {"--timeout", "-t", "--name", "-n", "--drive", "-d", "--filename", "-f", "--extra", "-e"}
_VARIABLE = re.compile(r"\$\{([^${}]*)\}")


@dataclass(frozen=True)
class BootAction:
    kind: str  # "chain" | "kernel" | "sanboot" | "local_disk" | "error" | "exit"
    chain_url: str = ""  # for kind == "chain", variables already expanded
    kernel_url: str = ""
    kernel_args: str = ""  # the kernel command line (without the URL), variables expanded
    initrd_urls: tuple[str, ...] = ()
    san_target: str = ""  # sanboot/sanhook URI
    message: str = ""  # what the script echoed (for error), joined by newlines


class _Ended(Exception):
    def __init__(self, action: BootAction) -> None:
        super().__init__(action.kind)
        self.action = action


def _format(value: str, kind: str) -> str:
    """iPXE's setting types, for the ones MAC/UUID settings use."""
    if kind == "hexhyp":
        return value.replace(":", "-")
    if kind == "hexraw":
        return value.replace(":", "")
    return value


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Expand ``${...}`` innermost first, as iPXE does; unknown names expand to ''."""
    while True:
        match = _VARIABLE.search(text)
        if match is None:
            return text
        name, _, kind = match.group(1).partition(":")
        text = text[: match.start()] + _format(variables.get(name, ""), kind) + text[match.end() :]


def _split_groups(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """[(operator joining this command to the previous one, argv)]."""
    groups: list[tuple[str, list[str]]] = [("", [])]
    for token in tokens:
        if token in ("||", "&&", ";"):
            groups.append((token, []))
        else:
            groups[-1][1].append(token)
    return groups


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("-") and rest[0] != "-":
        name = rest.pop(0)
        if "=" in name:
            key, value = name.split("=", 1)
            opts[key] = value
        elif name in _VALUE_OPTIONS and rest:
            opts[name] = rest.pop(0)
        else:
            opts[name] = ""
    return opts, rest


class _Machine:
    def __init__(self, script: str, variables: Mapping[str, str]) -> None:
        self.lines = script.splitlines()
        self.labels = {
            line.strip()[1:].split()[0]: i
            for i, line in enumerate(self.lines)
            if line.strip().startswith(":") and len(line.strip()) > 1
        }
        self.vars = dict(variables)
        if "mac" not in self.vars:
            self.vars["mac"] = self.vars.get("net0/mac", "")
        self.echoed: list[str] = []
        self.kernel_url = ""
        self.kernel_args = ""
        self.initrds: list[str] = []
        self.hooks: dict[str, str] = {}
        self.pc = 0

    def end(self, kind: str, **fields: object) -> None:
        raise _Ended(BootAction(kind=kind, message="\n".join(self.echoed), **fields))  # type: ignore[arg-type]

    def run(self) -> BootAction:
        first = self.lines[0].strip() if self.lines else ""
        if first != "#!ipxe":
            return BootAction(kind="error", message="not an iPXE script (no #!ipxe line)")
        steps = 0
        try:
            while self.pc < len(self.lines):
                steps += 1
                if steps > MAX_STEPS:
                    self.echoed.append(f"(interpreter: stopped after {MAX_STEPS} commands, the script loops)")
                    self.end("error")
                line = self.lines[self.pc].strip()
                self.pc += 1
                if not line or line.startswith(("#", ":")):
                    continue
                if not self.line(line):
                    self.echoed.append(f"(script failed at: {line})")
                    self.end("error")
        except _Ended as ended:
            return ended.action
        return BootAction(kind="exit", message="\n".join(self.echoed))

    def line(self, line: str) -> bool:
        """Run one line; False when it failed without a handler (iPXE then ends the script)."""
        # Like iPXE's system(): expand the whole line once, then split it.
        tokens = expand(line, self.vars).split()
        comment = next((i for i, token in enumerate(tokens) if token.startswith("#")), len(tokens))
        status = True
        for index, (operator, argv) in enumerate(_split_groups(tokens[:comment])):
            if index and operator != ";" and ((operator == "&&" and not status) or (operator == "||" and status)):
                continue
            status = self.command(argv) if argv else True
        return status

    def command(self, argv: list[str]) -> bool:
        name, args = argv[0], argv[1:]
        handler = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if handler is None:
            self.echoed.append(f"{name}: command not found")
            return False
        return bool(handler(args))

    def cmd_echo(self, args: list[str]) -> bool:
        if args and args[0] == "-n":
            args = args[1:]
        self.echoed.append(" ".join(args))
        return True

    def cmd_set(self, args: list[str]) -> bool:
        if not args:
            return False
        name = args[0].split(":", 1)[0]
        if len(args) == 1:
            self.vars.pop(name, None)
        else:
            self.vars[name] = " ".join(args[1:])
        return True

    def cmd_clear(self, args: list[str]) -> bool:
        for name in args:
            self.vars.pop(name.split(":", 1)[0], None)
        return bool(args)

    def cmd_inc(self, args: list[str]) -> bool:
        if not args:
            return False
        try:
            value = int(self.vars.get(args[0], "0") or "0") + (int(args[1]) if len(args) > 1 else 1)
        except ValueError:
            return False
        self.vars[args[0]] = str(value)
        return True

    def cmd_isset(self, args: list[str]) -> bool:
        return bool(args) and args[0] != ""

    def cmd_iseq(self, args: list[str]) -> bool:
        return len(args) == 2 and args[0] == args[1]

    def cmd_goto(self, args: list[str]) -> bool:
        if not args or args[0] not in self.labels:
            return False
        self.pc = self.labels[args[0]] + 1
        return True

    def cmd_imgfree(self, args: list[str]) -> bool:
        self.kernel_url, self.kernel_args, self.initrds = "", "", []
        return True

    def cmd_kernel(self, args: list[str]) -> bool:
        _, rest = _options(args)
        if not rest:
            return False
        self.kernel_url, self.kernel_args = rest[0], " ".join(rest[1:])
        return True

    cmd_imgselect = cmd_kernel
    cmd_imgload = cmd_kernel

    def cmd_initrd(self, args: list[str]) -> bool:
        _, rest = _options(args)
        if not rest:
            return False
        self.initrds.append(rest[0])
        return True

    cmd_imgfetch = cmd_initrd
    cmd_module = cmd_initrd

    def cmd_imgargs(self, args: list[str]) -> bool:
        if not args:
            return False
        self.kernel_args = " ".join(args[1:])
        return True

    def cmd_boot(self, args: list[str]) -> bool:
        if not self.kernel_url:
            self.echoed.append("boot: no image selected")
            return False
        self.end("kernel", kernel_url=self.kernel_url, kernel_args=self.kernel_args, initrd_urls=tuple(self.initrds))
        return True  # pragma: no cover - end() raises

    cmd_imgexec = cmd_boot

    def cmd_chain(self, args: list[str]) -> bool:
        _, rest = _options(args)
        if not rest:
            return False
        self.end("chain", chain_url=rest[0])
        return True  # pragma: no cover

    def cmd_sanhook(self, args: list[str]) -> bool:
        opts, rest = _options(args)
        if not rest:
            return False
        drive = opts.get("--drive", opts.get("-d", "0x80"))
        self.hooks[drive.lower()] = " ".join(rest)
        return True

    def cmd_sanboot(self, args: list[str]) -> bool:
        opts, rest = _options(args)
        drive = opts.get("--drive", opts.get("-d", "0x80")).lower()
        if rest:
            self.end("sanboot", san_target=" ".join(rest))
        if drive in self.hooks:
            self.end("sanboot", san_target=self.hooks[drive])
        self.end("local_disk")
        return True  # pragma: no cover

    def cmd_exit(self, args: list[str]) -> bool:
        try:
            status = int(args[0], 0) if args else 0
        except ValueError:
            status = 1
        self.end("exit" if status == 0 else "error")
        return True  # pragma: no cover

    def cmd_reboot(self, args: list[str]) -> bool:
        self.end("exit")
        return True  # pragma: no cover

    cmd_poweroff = cmd_reboot

    def cmd_sleep(self, args: list[str]) -> bool:
        return True

    def cmd_prompt(self, args: list[str]) -> bool:
        return True

    def cmd_dhcp(self, args: list[str]) -> bool:
        return True

    cmd_ifconf = cmd_dhcp
    cmd_ifopen = cmd_dhcp


def interpret_script(script: str, variables: Mapping[str, str]) -> BootAction:
    """The first boot-ending action of ``script`` run with iPXE settings ``variables``
    (``mac``, ``net0/mac``, ``net1/mac``, ``uuid``, ``ip``, ...)."""
    return _Machine(script, variables).run()
