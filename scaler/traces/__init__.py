"""The field's public traces, converted to the dataset format the simulator reads (`scaler trace import`).

Azure Functions 2019 (per-minute counts, duration and memory percentiles), Azure Functions 2021 (one
row per invocation) and Huawei Cloud 2023 (per-second or per-minute counts, with the private set's
execution times and memory limits; the 2025 cold-start table for init times). Every assumption a
conversion makes is written in docs/traces.md.
"""
