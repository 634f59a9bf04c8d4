"""RunInstances' error codes by what they mean for a launch, matched exactly.

The codes and their meanings are those of tencentcloud-sdk-python's `cvm.v20170312.errorcodes`
(the RunInstances reference lists the same ones). A code is never matched by its prefix:
`ResourceInsufficient.CidrBlock` (the subnet has no addresses left) shares a prefix with the
sold-out codes and means something else, and `LimitExceeded.VpcSubnetNum` is not a quota.
"""

from __future__ import annotations

# Not sold in this zone right now, or not at all here: try the next zone.
ZONE_UNAVAILABLE = {
    "ResourceInsufficient.AvailabilityZoneSoldOut": "the zone is sold out",
    "ResourceInsufficient.SpecifiedInstanceType": "the instance type is out of stock",
    "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance": "the instance type is sold out in the zone",
    "ResourceInsufficient.InsufficientOfferingMinimum": "the stock is below the number asked for",
    "ResourceInsufficient.CloudDiskSoldOut": "the system disk type is sold out in the zone",
    "InvalidParameter.InvalidCloudDiskSoldOut": "the cloud disk is sold out",
    "ResourcesSoldOut.AvailableZone": "the zone is sold out",
    "ResourcesSoldOut.SpecifiedInstanceType": "the instance type is sold out",
    "ResourcesSoldOut.EipInsufficient": "public IP addresses are sold out in the zone",
    "ResourceUnavailable.InstanceType": "the zone does not sell the instance type",
    "InvalidParameterValue.InsufficientOffering": "spot capacity is out of stock",
    "UnsupportedOperation.NoInstanceTypeSupportSpot": "the instance type is not sold as spot here",
}

# The bid is below the current spot price.
PRICE_TOO_LOW = "InvalidParameterValue.InsufficientPrice"

# The zone's subnet has no free address: another subnet of the zone, else the next zone.
SUBNET_FULL = {
    "FailedOperation.NoAvailableIpAddressCountInSubnet": "the subnet has no free IP address",
    "LimitExceeded.VpcSubnetNum": "the subnet has no free IP address",
    "ResourceInsufficient.CidrBlock": "the subnet's address range is used up",
}

# An account quota: stop, name it, say how to raise it.
QUOTAS = {
    "LimitExceeded.SpotQuota": "the spot instance quota of the region",
    "LimitExceeded.UserSpotQuota": "your account's spot instance quota",
    "LimitExceeded.InstanceQuota": "the instance quota of the zone",
    "LimitExceeded.CvmInstanceQuota": "the quota of instances you may buy",
    "InstancesQuotaLimitExceeded": "the instance quota of your account (the instances asked for exceed what is left)",
    "LimitExceeded.PrepayQuota": "the quota of prepaid instances",
}

# The account cannot pay: stop with one clear line (no other zone or offer helps).
BILLING = {
    "InvalidAccount.InsufficientBalance": "the account's balance is insufficient: top it up in the Tencent Cloud "
                                          "console (Billing Center) and run again",
    "InvalidAccount.UnpaidOrder": "the account has an unpaid order: pay or cancel it in the Tencent Cloud console "
                                  "(Billing Center) and run again",
}

# The host's CAM role cannot be given to the instance (not the caller's credentials).
ROLE = {
    "AuthFailure.CamRoleNameAuthenticateFailed": "Tencent Cloud refused to pass the CAM role {role} to the host: "
                                                 "the caller needs cam:PassRole on it and the role's trust policy must "
                                                 "name cvm.qcloud.com (`sdcloud infra up --provider tencent` sets both)",
    "InvalidParameterValue.CamRoleNameMalformed": "the CAM role name {role} is not valid: letters, digits and +=,.@_- only",
}


def meaning(code: str) -> str:
    """One of zone, price, subnet, quota, billing, role, or '' (none of these: the caller decides)."""
    if code in ZONE_UNAVAILABLE:
        return "zone"
    if code == PRICE_TOO_LOW:
        return "price"
    if code in SUBNET_FULL:
        return "subnet"
    if code in QUOTAS or code.startswith("LimitExceeded."):  # every other LimitExceeded.* is a quota too
        return "quota"
    if code in BILLING:
        return "billing"
    if code in ROLE:
        return "role"
    return ""
