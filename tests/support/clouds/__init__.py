"""Stand-ins for cloud APIs that moto lacks: EC2 placement groups, Tencent billing, the Vast.ai market."""
