"""Helpers for Chapter 2: devices, downloads, offline stand-ins, generation."""
