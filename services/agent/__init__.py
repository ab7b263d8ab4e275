"""Ferrum's deploy agent (IPA-compatible ramdisk side). See docs/agent.md."""

from services.agent.agent import AGENT_VERSION, Agent, AgentOptions, Disk, options_from_kernel_cmdline

__all__ = ["AGENT_VERSION", "Agent", "AgentOptions", "Disk", "options_from_kernel_cmdline"]
