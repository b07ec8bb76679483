#!/usr/bin/env bash
# Copy the files `agent.hardware.board` and the sensors (agent/hardware/sensors.py) read from this
# device into DEST, laid out like the root filesystem, so the board can be added as a fake tree
# under tests/fakes/ (docs/telemetry.md). Values only: model strings, temperatures and trip
# points, power rails, fan, GPU load, battery charge and the firmware's answers to vcgencmd;
# no serial numbers, MAC addresses, battery makers or host names.
# Usage: scripts/capture_board.sh DEST   (CAPTURE_ROOT=DIR reads a tree other than /, for tests)
set -euo pipefail
dest=${1:?usage: $0 DEST}
src=${CAPTURE_ROOT:-}
shopt -s nullglob
cd "${src:-/}"
files=(
  proc/device-tree/model
  sys/firmware/devicetree/base/model
  etc/nv_tegra_release
  sys/devices/system/cpu/online
  proc/driver/nvidia/gpus/*/information
  # thermal zones and trip points
  sys/class/thermal/thermal_zone*/{type,temp,mode}
  sys/class/thermal/thermal_zone*/trip_point_*_{temp,type,hyst}
  # Jetson INA3221: JetPack 5/6 hwmon, JetPack 4 iio
  sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*/{name,in*_label,in*_input,curr*_input}
  sys/bus/i2c/drivers/ina3221x/*/iio:device*/{name,rail_name_*,in_voltage*_input,in_current*_input,in_power*_input}
  # fans and hwmon names; JetPack 4's pwm-fan
  sys/class/hwmon/hwmon*/{name,pwm1,fan1_input,rpm}
  sys/devices/pwm-fan/{target_pwm,cur_pwm,rpm_measured}
  # GPU load and clock
  sys/class/devfreq/*/{cur_freq,device/load}
  # batteries and adapters (not serial_number, manufacturer, model_name)
  sys/class/power_supply/*/{type,scope,status,online,capacity,voltage_now,current_now,power_now}
)
case $dest in /*) ;; *) dest="$OLDPWD/$dest" ;; esac
for f in "${files[@]}"; do
  if [ -r "$f" ] && [ -f "$f" ]; then
    mkdir -p "$dest/$(dirname "$f")"
    cat "$f" > "$dest/$f" 2>/dev/null || : > "$dest/$f"   # cat, not cp: sysfs files report size 0; an unreadable one stays empty
    echo "captured /$f"
  fi
done
# Raspberry Pi firmware answers, replayed by tests/fakes/rpi5/usr/bin/vcgencmd (copy it to DEST/usr/bin)
if command -v vcgencmd > /dev/null; then
  mkdir -p "$dest/vcgencmd"
  for command in get_throttled measure_temp pmic_read_adc; do
    if vcgencmd "$command" > "$dest/vcgencmd/$command" 2>/dev/null; then
      echo "captured vcgencmd $command"
    else
      rm -f "$dest/vcgencmd/$command"
    fi
  done
fi
