CREATE TABLE doctors (
  id INTEGER PRIMARY KEY,
  name TEXT,
  specialty TEXT,
  years_experience INTEGER
);
CREATE TABLE patients (
  id INTEGER PRIMARY KEY,
  name TEXT,
  birth_year INTEGER,
  city TEXT
);
CREATE TABLE appointments (
  id INTEGER PRIMARY KEY,
  doctor_id INTEGER REFERENCES doctors(id),
  patient_id INTEGER REFERENCES patients(id),
  date TEXT,
  fee INTEGER,
  status TEXT
);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (1, 'Quinn Rossi', 'pediatrics', 24);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (2, 'Farid Okafor', 'dermatology', 19);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (3, 'Grace Rossi', 'cardiology', 4);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (4, 'Farid Moreau', 'dermatology', 20);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (5, 'Ana Kowalski', 'pediatrics', 25);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (6, 'Umar Smith', 'dermatology', 26);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (7, 'Hiro Ivanova', 'cardiology', 18);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (8, 'Quinn Chen', 'pediatrics', 14);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (9, 'Grace Haddad', 'orthopedics', 15);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (10, 'Wei Muller', 'cardiology', 2);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (11, 'Wei Ivanova', 'dermatology', 25);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (12, 'Priya Garcia', 'dermatology', 32);
INSERT INTO patients (id, name, birth_year, city) VALUES (1, 'Umar Rossi', 1967, 'Lisbon');
INSERT INTO patients (id, name, birth_year, city) VALUES (2, 'Farid Patel', 1945, 'Lisbon');
INSERT INTO patients (id, name, birth_year, city) VALUES (3, 'Maya Larsen', 1962, 'Osaka');
INSERT INTO patients (id, name, birth_year, city) VALUES (4, 'Zoe Garcia', 2013, 'Porto');
INSERT INTO patients (id, name, birth_year, city) VALUES (5, 'Quinn Chen', 1956, 'Osaka');
INSERT INTO patients (id, name, birth_year, city) VALUES (6, 'Ben Garcia', 2019, 'Lyon');
INSERT INTO patients (id, name, birth_year, city) VALUES (7, 'Wei Silva', 2017, 'Porto');
INSERT INTO patients (id, name, birth_year, city) VALUES (8, 'Zoe Novak', 1952, 'Lyon');
INSERT INTO patients (id, name, birth_year, city) VALUES (9, 'Farid Smith', 1979, 'Dublin');
INSERT INTO patients (id, name, birth_year, city) VALUES (10, 'David Dubois', 1972, 'Osaka');
INSERT INTO patients (id, name, birth_year, city) VALUES (11, 'Ben Novak', 1967, 'Dublin');
INSERT INTO patients (id, name, birth_year, city) VALUES (12, 'Umar Moreau', 1989, 'Krakow');
INSERT INTO patients (id, name, birth_year, city) VALUES (13, 'David Muller', 1945, 'Porto');
INSERT INTO patients (id, name, birth_year, city) VALUES (14, 'Quinn Larsen', 1978, 'Osaka');
INSERT INTO patients (id, name, birth_year, city) VALUES (15, 'Umar Smith', 1969, 'Krakow');
INSERT INTO patients (id, name, birth_year, city) VALUES (16, 'Wei Larsen', 1995, 'Porto');
INSERT INTO patients (id, name, birth_year, city) VALUES (17, 'Nora Chen', 1950, 'Austin');
INSERT INTO patients (id, name, birth_year, city) VALUES (18, 'Yara Tanaka', 1998, 'Lyon');
INSERT INTO patients (id, name, birth_year, city) VALUES (19, 'Ines Ivanova', 1963, 'Austin');
INSERT INTO patients (id, name, birth_year, city) VALUES (20, 'Ana Patel', 1946, 'Dublin');
INSERT INTO patients (id, name, birth_year, city) VALUES (21, 'Ines Smith', 2002, 'Oslo');
INSERT INTO patients (id, name, birth_year, city) VALUES (22, 'Wei Haddad', 2011, 'Austin');
INSERT INTO patients (id, name, birth_year, city) VALUES (23, 'Liam Garcia', 1961, 'Oslo');
INSERT INTO patients (id, name, birth_year, city) VALUES (24, 'Quinn Ivanova', 2018, 'Lisbon');
INSERT INTO patients (id, name, birth_year, city) VALUES (25, 'Umar Ivanova', 1943, 'Krakow');
INSERT INTO patients (id, name, birth_year, city) VALUES (26, 'Grace Muller', 2006, 'Lyon');
INSERT INTO patients (id, name, birth_year, city) VALUES (27, 'Chloe Haddad', 1940, 'Oslo');
INSERT INTO patients (id, name, birth_year, city) VALUES (28, 'Farid Silva', 1996, 'Oslo');
INSERT INTO patients (id, name, birth_year, city) VALUES (29, 'Kira Okafor', 2013, 'Dublin');
INSERT INTO patients (id, name, birth_year, city) VALUES (30, 'Farid Ivanova', 1986, 'Dublin');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (1, 8, 16, '2025-05-06', 150, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (2, 11, 25, '2023-05-03', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (3, 7, 21, '2024-09-09', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (4, 9, 24, '2023-06-18', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (5, 2, 21, '2023-04-15', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (6, 5, 17, '2023-11-18', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (7, 4, 22, '2025-06-11', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (8, 12, 16, '2025-07-25', 60, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (9, 5, 7, '2025-03-18', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (10, 2, 24, '2023-05-27', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (11, 10, 18, '2024-04-17', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (12, 10, 21, '2025-02-28', 80, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (13, 2, 7, '2025-03-23', 40, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (14, 9, 17, '2025-04-21', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (15, 7, 22, '2025-07-09', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (16, 3, 14, '2023-01-23', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (17, 7, 7, '2025-11-09', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (18, 11, 28, '2024-08-10', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (19, 4, 2, '2025-06-09', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (20, 9, 14, '2025-01-09', 200, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (21, 4, 28, '2023-02-11', 200, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (22, 3, 25, '2025-03-11', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (23, 12, 30, '2025-10-03', 40, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (24, 11, 16, '2025-10-06', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (25, 7, 27, '2024-08-26', 40, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (26, 3, 6, '2025-07-21', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (27, 3, 13, '2024-06-04', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (28, 4, 21, '2025-03-04', 40, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (29, 1, 4, '2024-11-11', 150, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (30, 12, 16, '2024-02-26', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (31, 1, 25, '2025-10-09', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (32, 9, 16, '2023-06-27', 40, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (33, 7, 14, '2025-08-27', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (34, 10, 26, '2023-07-08', 200, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (35, 12, 23, '2025-05-08', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (36, 5, 19, '2025-07-08', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (37, 7, 29, '2024-04-11', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (38, 5, 22, '2024-01-21', 40, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (39, 2, 22, '2023-08-21', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (40, 7, 11, '2024-04-17', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (41, 3, 6, '2025-12-03', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (42, 11, 13, '2025-09-17', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (43, 2, 29, '2025-03-03', 150, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (44, 12, 30, '2024-04-14', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (45, 5, 27, '2023-01-06', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (46, 4, 2, '2024-10-13', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (47, 12, 7, '2025-02-13', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (48, 10, 30, '2024-01-23', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (49, 7, 14, '2024-01-12', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (50, 11, 9, '2023-01-18', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (51, 8, 18, '2025-07-11', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (52, 12, 25, '2023-10-28', 80, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (53, 11, 2, '2024-12-11', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (54, 12, 2, '2023-10-06', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (55, 5, 17, '2023-07-20', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (56, 1, 3, '2024-07-23', 200, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (57, 9, 12, '2024-08-16', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (58, 8, 21, '2025-06-08', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (59, 6, 7, '2023-03-26', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (60, 11, 21, '2025-07-19', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (61, 9, 1, '2024-05-03', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (62, 5, 27, '2023-03-21', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (63, 4, 16, '2025-11-27', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (64, 6, 28, '2024-06-02', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (65, 11, 12, '2024-07-22', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (66, 6, 13, '2024-04-28', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (67, 6, 28, '2025-01-26', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (68, 9, 9, '2025-09-19', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (69, 11, 20, '2024-06-05', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (70, 12, 20, '2023-10-02', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (71, 8, 22, '2024-08-28', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (72, 9, 14, '2024-11-21', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (73, 9, 28, '2025-09-02', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (74, 2, 18, '2025-07-11', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (75, 2, 10, '2023-05-08', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (76, 11, 6, '2023-06-11', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (77, 11, 12, '2024-03-23', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (78, 12, 27, '2024-04-26', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (79, 3, 20, '2023-12-20', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (80, 2, 13, '2023-02-12', 60, 'cancelled');
